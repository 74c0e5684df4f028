"""Launch profiles: create, change, delete (refused while resumes or automatic resume
name it: their records would lose what ran).

The command template is the most dangerous value a project admin writes: LaunchProfile's
clean() refuses a template where a value could become code, and the job's extra
variables that would change how a program loads (LD_PRELOAD, PYTHONPATH, ...); it runs
here, whoever asks, and again at launch."""

from __future__ import annotations

from webapp.domain.actions.admin import (
    Caller,
    SettingConflict,
    SettingInvalid,
    apply,
    audit,
    changed,
    checked,
    own,
    require_admin,
    saved,
    update_row,
)
from webapp.domain.models import LaunchProfile

# What a change may touch, in the settings form's order; workdir and env are the two
# options the launcher reads (docs/slurm.md).
FIELDS = ("name", "kind", "host", "command_template")
OPTIONS = ("workdir", "env")
WORKDIR_MAX = 1000
ENV_MAX = 100


def _options(row: LaunchProfile, workdir, env) -> None:
    """Put `workdir` and `env` (None: leave as is) in the profile's options, checked."""
    options = dict(row.options or {})
    if workdir is not None:
        if not isinstance(workdir, str) or len(workdir) > WORKDIR_MAX or "\0" in workdir:
            raise SettingInvalid("workdir", f"an absolute path of at most {WORKDIR_MAX} characters")
        workdir = workdir.strip()
        if workdir and not workdir.startswith("/"):
            raise SettingInvalid("workdir", "Give an absolute path, like /scratch/alice/project.")
        options["workdir"] = workdir
    if env is not None:
        if not isinstance(env, dict) or len(env) > ENV_MAX:
            raise SettingInvalid("env", f"an object of at most {ENV_MAX} NAME: value pairs")
        for name, value in env.items():
            if not isinstance(value, str) or "\0" in value:
                raise SettingInvalid("env", f"{name}: a value is a string without NUL")
        options["env"] = dict(env)
    # An empty option is no option (the launcher's defaults).
    row.options = {key: value for key, value in options.items() if value}


def _clean(row: LaunchProfile) -> None:
    row.name = (row.name or "").strip()
    checked(row)  # the model's clean(): the template and the env names


def _options_of(row: LaunchProfile) -> dict:
    return {key: (row.options or {}).get(key) for key in OPTIONS}


def create_profile(
    caller: Caller, *, workdir: str | None = None, env: dict | None = None, **fields
) -> LaunchProfile:
    require_admin(caller)
    profile = LaunchProfile(project=caller.project)
    apply(profile, fields, FIELDS)
    _options(profile, workdir, env)
    _clean(profile)
    saved(profile, "A launch profile")
    audit(
        caller,
        "launch_profile.created",
        f"launch profile {profile.name!r} ({profile.kind}) created",
        launch_profile=profile.pk,
    )
    return profile


def update_profile(
    caller: Caller,
    profile: LaunchProfile,
    *,
    workdir: str | None = None,
    env: dict | None = None,
    **changes,
) -> list[str]:
    """Change what is given (None: unchanged); returns the fields that changed."""

    def cleaned(fresh: LaunchProfile, before: dict) -> list[str]:
        options_before = _options_of(fresh)
        _options(fresh, workdir, env)
        _clean(fresh)
        fields = changed(fresh, before)
        return fields + [k for k, v in _options_of(fresh).items() if v != options_before[k]]

    return update_row(caller, profile, changes, "launch profile", FIELDS, cleaned, ("options",))


def history(profile: LaunchProfile) -> str:
    """What refers to the profile, in words; empty when nothing does."""
    used = profile.resume_set.count()
    parts = [f"{used} resumes used it"] if used else []
    if profile.project.auto_resume_profile_id == profile.pk:
        parts.append("automatic resume uses it (Recovery)")
    return " and ".join(parts)


def delete_profile(caller: Caller, profile: LaunchProfile) -> None:
    """Delete; SettingConflict while history names it (edit it instead)."""
    require_admin(caller)
    own(caller, profile)
    if used := history(profile):
        raise SettingConflict(
            None,
            f"Launch profile {profile.name} is kept: {used}. Their records name it; "
            "edit it instead.",
        )
    pk = profile.pk
    profile.delete()
    audit(
        caller,
        "launch_profile.deleted",
        f"launch profile {profile.name!r} ({profile.kind}) deleted",
        launch_profile=pk,
    )
