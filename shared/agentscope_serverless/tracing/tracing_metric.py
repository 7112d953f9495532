"""The kinds of span: :class:`TraceType`."""

from __future__ import annotations


class TraceType:
    """The kind of a span: ``TraceType("LLM")``, or one of the constants."""

    LLM = "LLM"
    TOOL = "TOOL"
    AGENT_STEP = "AGENT_STEP"
    MEMORY = "MEMORY"
    SEARCH = "SEARCH"
    AIGC = "AIGC"
    RAG = "RAG"
    INTENTION = "INTENTION"
    PLUGIN = "PLUGIN"
    FUNCTION_CALL = "FUNCTION_CALL"
    AGENT = "AGENT"
    PLANNING = "PLANNING"
    CHAIN = "CHAIN"
    RETRIEVER = "RETRIEVER"
    RERANKER = "RERANKER"
    EMBEDDING = "EMBEDDING"
    TASK = "TASK"
    GUARDRAIL = "GUARDRAIL"
    REWRITER = "REWRITER"
    OTHER = "OTHER"

    def __init__(self, value: str) -> None:
        self.value = value

    def __str__(self) -> str:
        return self.value


__all__ = ["TraceType"]
