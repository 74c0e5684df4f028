"""What every settings page does with a change: ask the action (webapp.domain.actions,
the same function the API's /settings/ routes call), then redirect with a message, or
put the refusal on the form (or, for a button without a form, in a message)."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import redirect

from webapp.domain import actions


def caller_of(request) -> actions.Caller:
    """The signed-in person as the actions see them; their role is read again there."""
    return actions.Caller.of_user(request.project, request.user)


def change(
    request,
    action: Callable[[actions.Caller], object],
    to: str,
    *,
    form=None,
    done: Callable[[object], str | None] | None = None,
    level=messages.success,
):
    """Carry out `action(caller)`. Done: a redirect to the page `to`, with `done(result)`
    as a message. Refused: None with the refusal on `form`'s field (the page is shown
    again), or without a form a redirect with the refusal as an error message."""
    try:
        result = action(caller_of(request))
    except actions.NotAllowed as exc:
        raise PermissionDenied(str(exc)) from None
    except actions.SettingInvalid as exc:
        if form is None:
            messages.error(request, exc.message)
            return redirect(to, request.project.slug)
        form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        return None
    text = done(result) if done else None
    if text:
        level(request, text)
    return redirect(to, request.project.slug)


def submitted(
    request,
    form,
    action: Callable[[actions.Caller], object],
    to: str,
    done: Callable[[object], str | None] | None = None,
):
    """change() for a page's form: on a valid POST, `action(caller)` as change() carries
    it out. None when the page is to be shown: a GET, an invalid form, or a refusal (then
    on the form)."""
    if request.method == "POST" and form.is_valid():
        return change(request, action, to, form=form, done=done)
    return None


def added(request, form, create: Callable[..., object], kind: str, to: str):
    """A settings page's add form: on a valid POST, `create(caller, **form.cleaned_data)`,
    then back to `to` saying "<kind> <name> is added."; None as submitted()."""
    return submitted(
        request,
        form,
        lambda caller: create(caller, **form.cleaned_data),
        to,
        lambda row: f"{kind} {row.name} is added.",
    )
