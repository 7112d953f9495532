"""A formatter that is never called (the scripted agent needs none)."""


class DashScopeChatFormatter:
    pass
