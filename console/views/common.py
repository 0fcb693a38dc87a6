"""Helpers shared by the console views: htmx-aware rendering and the POST answer rules.

- A page template defines its fragments with `{% partialdef %}`; an htmx request gets
  `page.html#fragment`, a normal request the whole page.
- Only non-htmx POSTs redirect (post/redirect/get); an htmx POST answers with the fragments
  it changed, some of them out-of-band.
- A `DomainError` is an answer, not a crash: it shows as a message next to the control.
- Every action is `act`: validate the form, call one service, turn a domain error into a
  message, then redirect (no htmx, or a page without fragments) or answer with the page's own
  fragments (htmx). A control posts to an endpoint of the page it is on, so the answer never
  depends on where it came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import NON_FIELD_ERRORS
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext, pgettext
from django_htmx.middleware import HtmxDetails

from console.access import Access, request_access
from console.refusals import refusal_sentence
from runs.access import Capability
from runs.actors import Actor
from runs.errors import DomainError
from runs.labels import label_for


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


class DecidableTeams:
    """`team_id in …` for the templates: the teams where the user may decide approvals."""

    def __init__(self, access: Access) -> None:
        self.ids = access.ids_may(Capability.REVIEW)

    def __contains__(self, team_id: object) -> bool:
        return self.ids is None or team_id in self.ids


def wants_fragment(request: HtmxHttpRequest) -> bool:
    """An htmx request that will swap part of the page (not a history restore, which needs it all)."""
    return bool(request.htmx) and not request.htmx.history_restore_request


def base_context(request: HtmxHttpRequest) -> dict[str, Any]:
    return {"access": request_access(request)}


def page(
    request: HtmxHttpRequest, template: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    response = render(request, template, {**base_context(request), **context}, status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response


def fragments(
    request: HtmxHttpRequest,
    template: str,
    main: str | None,
    context: dict[str, Any],
    *,
    oob: Iterable[str] = (),
    status: int = 200,
    prefix: str = "",
) -> HttpResponse:
    """Render `template#main`, then each of `oob` as an out-of-band swap, in one response."""
    ctx = {**base_context(request), **context}
    parts = [prefix] if prefix else []
    if main:
        parts.append(render_to_string(f"{template}#{main}", {**ctx, "oob": False}, request=request))
    for name in oob:
        parts.append(render_to_string(f"{template}#{name}", {**ctx, "oob": True}, request=request))
    response = HttpResponse("".join(parts), status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response


def actor_of(request: HttpRequest) -> Actor:
    return Actor.for_user(request.user)


def error_text(error: DomainError) -> str:
    """A refusal as the console shows it: in the reader's words, with the run's state now."""
    status = (
        gettext(" (run is %(status)s)") % {"status": label_for(error.status)}
        if error.status
        else ""
    )
    return f"{refusal_sentence(error)}{status}"


def redirect_with(
    request: HttpRequest, url: str, *, ok: str = "", error: DomainError | str | None = None
) -> HttpResponse:
    """The non-htmx answer to a POST: a message for the next page, and a redirect."""
    if ok:
        messages.success(request, ok)
    if error is not None:
        messages.error(request, error_text(error) if isinstance(error, DomainError) else error)
    return HttpResponseRedirect(url)


def form_errors(form: Any, *, leave_out: Iterable[str] = ()) -> str:
    """One line from a form's errors, for a message next to a small control: each field's
    errors after its label, in the reader's language ("原因：…", never the field's code name).

    `leave_out` names fields whose errors the page shows beside the field itself."""
    parts = []
    for name, errors in form.errors.items():
        if name in leave_out:
            continue
        text = " ".join(str(error) for error in errors)
        if name == NON_FIELD_ERRORS:
            parts.append(text)
        else:
            parts.append(
                gettext("%(field)s: %(errors)s")
                % {"field": field_label(form, name), "errors": text}
            )
    if not parts:
        return "" if leave_out else gettext("invalid input")
    return pgettext("joins the errors of a form's fields", "; ").join(parts)


def field_label(form: Any, name: str) -> str:
    """A field's label as a person reads it; a field without one shows its name (a missing
    translated label stays visible instead of passing for English prose)."""
    field = form.fields.get(name)
    return str(field.label) if field is not None and field.label else name


@dataclass(frozen=True)
class Outcome:
    """What an action says next to its control: one line, success or error."""

    ok: str = ""
    error: str = ""


def act(
    request: HtmxHttpRequest,
    *,
    form: forms.Form | None,
    service: Callable[[dict[str, Any]], str],
    back: str,
    fragment: Callable[[Outcome], HttpResponse] | None,
) -> HttpResponse:
    """The one shape of a console action.

    1. Validate `form` (if any); invalid input is the outcome's error.
    2. Call `service` with the cleaned data; it returns the success line.
    3. A `DomainError` (illegal transition, stale state) becomes the outcome's error.
    4. No htmx, or no `fragment` (a settings page's delete or revoke, which always answers
       with its list page): the line becomes a message and the answer a redirect to `back`.
       htmx: the page's `fragment` for the outcome.
    """
    if form is not None and not form.is_valid():
        outcome = Outcome(error=form_errors(form))
    else:
        try:
            outcome = Outcome(ok=service(form.cleaned_data if form is not None else {}))
        except DomainError as error:
            outcome = Outcome(error=error_text(error))
    if not request.htmx or fragment is None:
        return redirect_with(request, back, ok=outcome.ok, error=outcome.error or None)
    return fragment(outcome)


@dataclass(frozen=True)
class FilterError:
    """One filter a person typed that could not be read: its field, label and what is wrong."""

    field: str
    label: str
    message: str


def filter_errors(form: forms.Form) -> list[FilterError]:
    """The errors of a bound filter form, one per field, in the form's order.

    A filter that fails to parse narrows the page to nothing and says why: falling back to
    "no filter" would widen a question the person asked (an export of one actor's entries
    would export the whole ledger)."""
    if not form.is_bound or form.is_valid():
        return []
    found: list[FilterError] = []
    for name, errors in form.errors.items():
        label = field_label(form, name) if name in form.fields else ""
        found.extend(FilterError(name, label, str(error)) for error in errors)
    return found
