"""Sign-in through the organisation's IdP and its SCIM provisioning endpoint (DESIGN §16)."""

from __future__ import annotations

from django.urls import path

from accounts import oidc, scim

app_name = "accounts"

urlpatterns = [
    path("login/sso/", oidc.StartView.as_view(), name="sso_start"),
    path("login/sso/callback/", oidc.CallbackView.as_view(), name="sso_callback"),
    # No trailing slash: SCIM clients send none (RFC 7644 §3.2 paths).
    path("scim/v2/Users", scim.users, name="scim_users"),
    path("scim/v2/Users/<str:user_id>", scim.user, name="scim_user"),
]
