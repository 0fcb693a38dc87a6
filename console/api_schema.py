"""The OpenAPI schema, generated once per process and language.

drf-spectacular's view walks every view and serializer on each request (about a third of a
second of CPU here): a reader opening the API docs pays it twice (the viewer asks for the
schema), and anyone can make the server pay it in a loop. The schema depends only on the code,
the language its descriptions are rendered in and the API version, so it is kept per
(language, version); a deploy starts new processes, which generate it again.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from django.conf import settings
from django.utils import translation
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.views import SpectacularAPIView
from rest_framework.request import Request
from rest_framework.response import Response


class CachedSchemaView(SpectacularAPIView):
    """SpectacularAPIView with the generated schema cached (see the module docstring)."""

    def _get_schema_response(self, request: Request) -> Response:
        # The API is not versioned (no versioning class): a `?version=` would only make another
        # cache key for the same document.
        version = self.api_version or request.version
        schema = _schema(_language(), version)
        return Response(
            data=schema,
            headers={
                "Content-Disposition": f'inline; filename="{self._get_filename(request, version)}"'
            },
        )


def _language() -> str:
    """The language the schema is rendered in: an unknown `?lang=` (which drf-spectacular
    activates as given) renders the default language's text, so it shares that key."""
    try:
        return translation.get_supported_language_variant(translation.get_language() or "")
    except LookupError:
        return settings.LANGUAGE_CODE


@lru_cache(maxsize=8)
def _schema(language: str, version: str | None) -> dict[str, Any]:
    # `public=True` (the view's own default): the schema does not depend on who asks, so it is
    # generated without a request.
    generator = spectacular_settings.DEFAULT_GENERATOR_CLASS(api_version=version)
    with translation.override(language):
        return generator.get_schema(request=None, public=True)
