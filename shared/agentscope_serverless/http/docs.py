"""The API's docs page (``/docs``): Swagger UI of one version, its files checked by hash.

Users paste their key into this page, on the API's own origin, so it runs nothing but the
Swagger UI files of the version named here, each checked against its hash (Subresource
Integrity: a CDN serving anything else is refused by the browser), and its own short
script, allowed by its hash in the page's Content-Security-Policy. The page talks to its
own origin only.

>>> page = docs_page("/openapi.json", "My API - docs")
>>> page.headers["Content-Security-Policy"].startswith("default-src 'none'")
True
"""

from __future__ import annotations

import base64
import hashlib
import html
import json

from fastapi.responses import HTMLResponse

# swagger-ui-dist's files, as npm's package of this version holds them (jsDelivr serves
# them unchanged). A new version needs both hashes of its files:
# openssl dgst -sha384 -binary <file> | openssl base64 -A
SWAGGER_UI = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5.35.0"
_SCRIPT_INTEGRITY = "sha384-gjRm0bEPMeTmMh5jT2cHccIwCUZSTd8YC+j0d0sXw0MdGEfScduGpSyF3ZSSLkX9"
_STYLE_INTEGRITY = "sha384-WlYgdmXYOOBWL5apwjDEZwN+U3HmXSSu5R6V5aGxEcf7z+KuRNwBhoxKVN1i3D5I"


def docs_page(openapi_url: str, title: str) -> HTMLResponse:
    """The docs page of the schema at ``openapi_url``, with its Content-Security-Policy."""
    # Escaped for a script element: no "</script>" can end it early.
    url = json.dumps(openapi_url).replace("<", "\\u003c")
    script = (
        f"SwaggerUIBundle({{url: {url}, dom_id: '#swagger-ui', layout: 'BaseLayout', "
        "deepLinking: true, showExtensions: true, showCommonExtensions: true, "
        "validatorUrl: null, presets: [SwaggerUIBundle.presets.apis, "
        "SwaggerUIBundle.SwaggerUIStandalonePreset]});"
    )
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="{SWAGGER_UI}/swagger-ui.css" integrity="{_STYLE_INTEGRITY}" crossorigin="anonymous">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{SWAGGER_UI}/swagger-ui-bundle.js" integrity="{_SCRIPT_INTEGRITY}" crossorigin="anonymous"></script>
<script>{script}</script>
</body>
</html>
"""  # noqa: E501
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {SWAGGER_UI}/ 'sha256-{digest}'",
            # Swagger UI sets style attributes as it renders.
            f"style-src {SWAGGER_UI}/ 'unsafe-inline'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'none'",
        )
    )
    headers = {"Content-Security-Policy": policy, "Referrer-Policy": "no-referrer"}
    return HTMLResponse(page, headers=headers)


__all__ = ["SWAGGER_UI", "docs_page"]
