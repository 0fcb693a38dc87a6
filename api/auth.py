"""Bearer-token authentication for agent runtimes and reviewer scripts."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from api.agent_version import check_agent_version
from api.ratelimit import bearer_failure_record, bearer_guessing_wait, client_address
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


class TokenGuessingThrottled(exceptions.Throttled):
    """Too many wrong bearer tokens from this address (`api.ratelimit`): 429."""

    def __init__(self, wait: float) -> None:
        super().__init__(
            wait=wait,
            detail="too many wrong bearer tokens from this address; retry after the wait",
        )


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        address = client_address(request)
        wait = bearer_guessing_wait(client_ip=address)
        if wait is not None:
            raise TokenGuessingThrottled(wait)
        parts = header.split()
        if len(parts) != 2 or parts[0].lower() != self.keyword.lower():
            self._failed(address)
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
        token = api_token_authenticate(parts[1])
        if token is None:
            self._failed(address)
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        check_agent_version(request.META)  # 426 client_too_old: an agent older than the contract
        return TokenPrincipal(token), token

    @staticmethod
    def _failed(address: str) -> None:
        wait = bearer_failure_record(client_ip=address)
        if wait is not None:
            raise TokenGuessingThrottled(wait)

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
