"""The HTTP routers, one module per concern; ``create_app`` mounts them by name."""
