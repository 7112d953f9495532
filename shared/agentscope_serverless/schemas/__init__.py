"""The agent protocol (messages, requests, responses, events) and the session model."""

from agentscope_serverless.schemas.agent_schemas import (
    AgentRequest,
    AgentResponse,
    Content,
    ContentType,
    DataContent,
    Error,
    Event,
    FunctionCall,
    FunctionCallOutput,
    FunctionTool,
    ImageContent,
    Message,
    MessageType,
    Role,
    RunStatus,
    TextContent,
    Tool,
)
from agentscope_serverless.schemas.pagination import Page
from agentscope_serverless.schemas.session import Session

__all__ = [
    "AgentRequest",
    "AgentResponse",
    "Content",
    "ContentType",
    "DataContent",
    "Error",
    "Event",
    "FunctionCall",
    "FunctionCallOutput",
    "FunctionTool",
    "ImageContent",
    "Message",
    "MessageType",
    "Page",
    "Role",
    "RunStatus",
    "Session",
    "TextContent",
    "Tool",
]
