"""Bearer-token authentication for agent runtimes and reviewer scripts."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from runs.api.agent_version import check_agent_version
from runs.models import ApiToken
from runs.tokens import api_token_authenticate


class TokenPrincipal:
    """What `request.user` is for a token: authenticated, scoped to the token's team."""

    is_authenticated = True
    is_anonymous = False
    is_staff = False
    is_superuser = False

    def __init__(self, token: ApiToken) -> None:
        self.token = token
        self.pk = None
        self.username = token.name

    def __str__(self) -> str:
        return self.token.name


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword.lower():
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
        token = api_token_authenticate(parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        check_agent_version(request.META)  # 426 client_too_old: an agent older than the contract
        return TokenPrincipal(token), token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
