"""The service's faces: the HTTP API (``app``: routes; ``endpoint``: one
error mapping; ``envelope``: the response and body shapes), its read views
(``evidence``), MCP over HTTP and stdio (``mcp``, ``mcp_stdio``), the
OpenAPI document (``openapi``) and the ``titen serve`` edge (``edge``)."""
