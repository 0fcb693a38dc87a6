"""Django admin: the group → team-role table (admins keep it), identity links (read-only), and
the user page, where unticking "active" deprovisions at once through `user_deactivate`."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.models import GroupRole, GroupRoleSource, IdentityLink
from accounts.services import user_deactivate, user_reactivate
from runs.actors import Actor

User = get_user_model()


@admin.register(GroupRole)
class GroupRoleAdmin(admin.ModelAdmin):
    """An IdP group's members hold a role on a team; applied at every sign-in. A row an admin
    saves becomes the admin's: the SAFESTOP_OIDC_GROUP_ROLES seed no longer changes it."""

    list_display = ["group", "team", "role", "source", "created_at"]
    list_filter = ["role", "team", "source"]
    search_fields = ["group", "team__slug"]
    autocomplete_fields = ["team"]
    readonly_fields = ["source", "created_at"]

    def save_model(self, request: HttpRequest, obj: GroupRole, form: Any, change: bool) -> None:
        obj.source = GroupRoleSource.ADMIN
        super().save_model(request, obj, form, change)


@admin.register(IdentityLink)
class IdentityLinkAdmin(admin.ModelAdmin):
    """Made by a first sign-in; deleting one makes the person's next sign-in a new user."""

    list_display = ["subject", "issuer", "user", "created_at", "last_login_at"]
    search_fields = ["subject", "user__username", "issuer"]
    readonly_fields = ["issuer", "subject", "user", "created_at", "last_login_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.unregister(User)


@admin.register(User)
class SafestopUserAdmin(UserAdmin):
    actions = ["deactivate"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """`is_active` goes through the services, so deactivating here ends sessions and sockets,
        revokes the person's reviewer tokens and returns their handoffs, as SCIM does."""
        was_active = (
            User.objects.filter(pk=obj.pk).values_list("is_active", flat=True).first()
            if change
            else None
        )
        wants_active = obj.is_active
        if change and was_active is not None and was_active != wants_active:
            obj.is_active = was_active  # the service makes the change and ledgers it
        super().save_model(request, obj, form, change)
        if change and was_active is not None and was_active != wants_active:
            actor = Actor.for_user(request.user)
            if wants_active:
                user_reactivate(user_id=obj.pk, actor=actor, via="admin")
            else:
                user_deactivate(user_id=obj.pk, actor=actor, via="admin")
            obj.is_active = wants_active

    @admin.action(description="Deactivate the selected users (ends their sessions at once)")
    def deactivate(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actor = Actor.for_user(request.user)
        for user in queryset.filter(is_active=True).exclude(pk=request.user.pk):
            user_deactivate(user_id=user.pk, actor=actor, via="admin")
        self.message_user(request, "Deactivated.")
