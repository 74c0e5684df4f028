"""Which Unix user a launched job (and a restore test's checks of a project's own code)
runs as: never the one of a Lifeboat process that holds secrets.

A clean environment is no boundary while the job runs as the worker's own user: it can
read /proc/<worker>/environ (SECRET_KEY, the S3 keys, DATABASE_URL), the worker's var/
and every file the worker can. So the deployment names, in LAUNCH_RUN_AS, the user each
project's jobs run as ("ml-jobs" for all, or "llm=llm-jobs,vision=vision-jobs,*=jobs"),
and the launch worker starts them through `setpriv` as that user, its groups and nothing
else (no capability, no new privileges). Switching users takes root: a launch (or
restore) worker with LAUNCH_RUN_AS runs as root, holds no more than it needs to start
and follow jobs, and the job it starts cannot read anything of it.

Without LAUNCH_RUN_AS, local launches and restore checks are refused, unless the
deployment says LAUNCH_LOCAL_SAME_USER=1: one person on one machine (`make run`), where
the job and Lifeboat are the same person anyway.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass

from django.conf import settings


class RunAsRefused(Exception):
    """This deployment cannot start the job without handing it the worker's secrets."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int
    home: str


def _mapping() -> dict[str, str]:
    """LAUNCH_RUN_AS as {project slug or *: user}."""
    out: dict[str, str] = {}
    for entry in settings.LAUNCH_RUN_AS:
        slug, sep, user = entry.partition("=")
        if not sep:
            slug, user = "*", entry
        if slug.strip() and user.strip():
            out[slug.strip()] = user.strip()
    return out


def user_for(project_slug: str) -> JobUser | None:
    """The user this project's jobs run as; None where the deployment named none (then
    see refusal()). RunAsRefused when the named user does not exist here or is root."""
    mapping = _mapping()
    name = mapping.get(project_slug) or mapping.get("*")
    if not name:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise RunAsRefused(
            f"LAUNCH_RUN_AS names the user {name!r}, who is not on this host"
        ) from None
    if entry.pw_uid == 0:
        raise RunAsRefused(
            "LAUNCH_RUN_AS may not name root: jobs must not hold the worker's rights"
        )
    if entry.pw_uid == os.geteuid():
        raise RunAsRefused(
            f"LAUNCH_RUN_AS names {name!r}, the launch worker's own user: its jobs could read "
            "the worker's secrets"
        )
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def for_project(project_slug: str) -> JobUser | None:
    """The user to run this project's job as, or None to run it as the worker's own user
    (only where LAUNCH_LOCAL_SAME_USER allows). Raises RunAsRefused with the reason."""
    user = user_for(project_slug)
    if user is not None:
        if os.geteuid() != 0:
            raise RunAsRefused(
                f"jobs of this project run as {user.name} (LAUNCH_RUN_AS), and only a launch "
                "worker running as root can start them as another user"
            )
        if not setpriv():
            raise RunAsRefused("setpriv (util-linux) is not installed on the launch host")
        return user
    if settings.LAUNCH_LOCAL_SAME_USER:
        return None
    raise RunAsRefused(
        "this deployment would start the job as the launch worker's own user, who holds "
        "Lifeboat's secrets: set LAUNCH_RUN_AS to the user jobs run as (or, for one person "
        "on one machine, LAUNCH_LOCAL_SAME_USER=1)"
    )


def setpriv() -> str | None:
    return shutil.which("setpriv", path=os.defpath + ":/usr/bin:/bin")


def prefix(user: JobUser | None) -> list[str]:
    """What goes before the job's command to run it as `user`: its uid, its group and
    supplementary groups, no capabilities, no way to gain privileges."""
    if user is None:
        return []
    return [
        setpriv() or "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        "--init-groups",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
    ]


def hand_over(user: JobUser | None, dir_fd: int) -> None:
    """Give a tree the worker wrote for the job (a restored checkpoint, walked from its
    descriptor, links never followed) to the job's user, so that the job can read and
    replace it."""
    if user is None:
        return
    os.chown(dir_fd, user.uid, user.gid)
    for _root, dirs, files, root_fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs + files:
            os.chown(name, user.uid, user.gid, dir_fd=root_fd, follow_symlinks=False)
