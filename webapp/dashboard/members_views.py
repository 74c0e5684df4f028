"""A project's members, for its admins: add a person by user name, change a role, remove
someone. The last admin cannot be removed or demoted (Membership refuses it, so the
Django admin and any other caller are held to the same rule). Every change is an audit
Event."""

from __future__ import annotations

from django import forms
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.setting_changes import change
from webapp.dashboard.settings_views import _settings_context
from webapp.domain import actions
from webapp.domain.models import Membership
from webapp.domain.models.projects import Role


class MemberForm(forms.Form):
    # Whether such a user exists is the action's to say (and to audit when not).
    username = forms.CharField(label="User name", max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def members(request):
    form = MemberForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        done = change(
            request,
            lambda caller: actions.add_member(caller, data["username"], data["role"]),
            "dashboard:settings-members",
            form=form,
            done=lambda m: f"{m.user} is a member of {request.project}: {m.role}.",
        )
        if done is not None:
            return done
    rows = request.project.memberships.select_related("user").order_by("user__username")
    return render(
        request,
        "dashboard/settings_members.html",
        _settings_context(request, form=form, memberships=rows, roles=Role.choices, tab="members"),
    )


@require_POST
@project_view(Role.ADMIN)
def member_role(request, membership_id: int):
    membership = get_object_or_404(
        Membership.objects.select_related("user"), project=request.project, pk=membership_id
    )
    role = request.POST.get("role", "")
    return change(
        request,
        lambda caller: actions.change_role(caller, membership, role),
        "dashboard:settings-members",
        done=lambda changed: f"{membership.user} is now {role}." if changed else None,
    )


@require_POST
@project_view(Role.ADMIN)
def member_remove(request, membership_id: int):
    membership = get_object_or_404(
        Membership.objects.select_related("user"), project=request.project, pk=membership_id
    )
    return change(
        request,
        lambda caller: actions.remove_member(caller, membership),
        "dashboard:settings-members",
        done=lambda _: f"{membership.user} is no longer a member.",
    )
