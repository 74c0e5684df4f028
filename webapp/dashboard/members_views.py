"""A project's members, for its admins: add a person by user name, change a role, remove
someone. The last admin cannot be removed or demoted (Membership refuses it, so the
Django admin and any other caller are held to the same rule). Every change is an audit
Event."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from webapp.dashboard.access import project_view
from webapp.dashboard.settings_views import _settings_context, audit
from webapp.domain.models import Membership
from webapp.domain.models.projects import LastAdmin, Role


class MemberForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.VIEWER)

    def clean_username(self):
        name = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=name, is_active=True).first()
        if user is None:
            raise forms.ValidationError(
                f"No active user is called {name!r}: accounts are created by the "
                "deployment's administrator (Django admin, /admin/)."
            )
        self.user = user
        return name


@require_http_methods(["GET", "POST"])
@project_view(Role.ADMIN)
def members(request):
    form = MemberForm(request.POST or None)
    if request.method == "POST" and not form.is_valid() and "username" in form.errors:
        # The answer tells whether such a user exists (docs/security.md, known limits):
        # every miss is audited, so a project admin probing names is seen doing it.
        asked = str(request.POST.get("username", ""))[:150]
        audit(request, "member.lookup_failed", f"no active user {asked!r} to add")
    if request.method == "POST" and form.is_valid():
        role = form.cleaned_data["role"]
        try:
            with transaction.atomic():
                Membership.objects.create(project=request.project, user=form.user, role=role)
        except IntegrityError:
            form.add_error("username", f"{form.user} is already a member; change the role above.")
        else:
            audit(request, "member.added", f"{form.user} added as {role}", user=form.user.pk)
            messages.success(request, f"{form.user} is a member of {request.project}: {role}.")
            return redirect("dashboard:settings-members", request.project.slug)
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
    role, old = request.POST.get("role", ""), membership.role
    if role not in Role.values:
        messages.error(request, f"Unknown role {role!r}.")
    elif role != old:
        membership.role = role
        try:
            membership.save(update_fields=["role"])
        except LastAdmin as exc:
            messages.error(request, exc.messages[0])
        else:
            audit(
                request,
                "member.role_changed",
                f"{membership.user}: {old} → {role}",
                user=membership.user_id,
                old=old,
                new=role,
            )
            messages.success(request, f"{membership.user} is now {role}.")
    return redirect("dashboard:settings-members", request.project.slug)


@require_POST
@project_view(Role.ADMIN)
def member_remove(request, membership_id: int):
    membership = get_object_or_404(
        Membership.objects.select_related("user"), project=request.project, pk=membership_id
    )
    try:
        membership.delete()
    except LastAdmin as exc:
        messages.error(request, exc.messages[0])
    else:
        audit(
            request,
            "member.removed",
            f"{membership.user} ({membership.role}) removed",
            user=membership.user_id,
        )
        messages.success(request, f"{membership.user} is no longer a member.")
    return redirect("dashboard:settings-members", request.project.slug)
