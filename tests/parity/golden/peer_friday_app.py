"""The app behind the golden transcripts: AgentScope Runtime 1.0.5 AgentApp serving 'Hi! My name is Friday.' in 3 deltas.

usage: python peer_friday_app.py MODE PORT  (in a venv with agentscope-runtime==1.0.5, a2a-sdk<1, agentscope==1.0.21)
  MODE: as      - @app.query(framework="agentscope"), agentscope Msg (msg, last) pairs (canonical)
        as_err  - same, raises after the first delta
        text    - Runner subclass with framework_type="text" (the peer's text adapter)
        text_err- same, raises after the first delta
"""

import sys

from agentscope.message import Msg
from agentscope_runtime.engine import AgentApp, Runner

MODE, PORT = sys.argv[1], int(sys.argv[2])
PIECES = ["Hi! ", "My name is ", "Friday."]

if MODE.startswith("as"):
    app = AgentApp(app_name="Friday", app_description="compat probe")

    @app.query(framework="agentscope")
    async def query_func(self, msgs, request=None, **kwargs):
        text = ""
        msg = Msg("Friday", "", "assistant")
        for i, piece in enumerate(PIECES):
            text += piece
            msg.content = [{"type": "text", "text": text}]
            yield msg, i == len(PIECES) - 1
            if MODE == "as_err":
                raise RuntimeError("boom after one delta")
else:

    class FridayRunner(Runner):
        def __init__(self):
            super().__init__()
            self.framework_type = "text"

        async def query_handler(self, *args, **kwargs):
            for piece in PIECES:
                yield piece
                if MODE == "text_err":
                    raise RuntimeError("boom after one delta")

    app = AgentApp(app_name="Friday", app_description="compat probe", runner=FridayRunner())

if __name__ == "__main__":
    app.run(host="127.0.0.1", port=PORT)
