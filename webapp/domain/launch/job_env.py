"""What a launched job's environment holds, and nothing else.

The launch worker holds the deployment's secrets (DATABASE_URL, REDIS_URL, SECRET_KEY,
S3 keys): a job started with `{**os.environ, ...}` (or sbatch `--export=ALL`) would see
them all. A job gets exactly, later entries winning:
1. a minimal base copied from the worker, the names in LAUNCH_BASE_ENV (default PATH,
   HOME, USER, LOGNAME, LANG, LC_ALL, TZ, when set): they say where programs are, whose
   home it is and how to print text, carry no credential, and a job without them cannot
   find `python` or write to `~`;
2. the profile's own `options.env` (written by a project admin);
3. the resume's values: one LIFEBOAT_<NAME> per template placeholder
   (webapp/domain/launch/template.py), LIFEBOAT_RUN (the new run's key),
   LIFEBOAT_RESUMED_FROM, LIFEBOAT_CHECKPOINT, LIFEBOAT_URL (LAUNCH_LIFEBOAT_URL, default
   SITE_URL) and LIFEBOAT_TOKEN (made for this resume: webapp/domain/launch/job_token.py).
"""

from __future__ import annotations

import os
import re

from django.conf import settings

from webapp.domain.launch.template import variables

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Variables that choose which program runs or change how programs load and what a shell
# does before the command: a profile may not set them (refused when it is saved, and
# again at launch for a profile saved before). The job's PATH is the worker's
# (LAUNCH_BASE_ENV); a profile names its programs by absolute path instead.
LOADER_NAMES = frozenset(
    {
        "PATH", "BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "CDPATH",
        "GLOBIGNORE", "PROMPT_COMMAND", "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB",
        "PERLLIB", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
        "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_HOST_CONF", "GIT_EXEC_PATH",
    }
)  # fmt: skip
LOADER_PREFIXES = ("LD_", "PYTHON", "BASH_FUNC_", "MALLOC_", "GLIBC_", "DYLD_", "SLURM_", "SBATCH_")


def refusal(name: str) -> str | None:
    """Why a profile may not set this variable, or None."""
    if not _NAME.match(str(name)):
        return f"{name!r} is not a variable name"
    if name in LOADER_NAMES or name.startswith(LOADER_PREFIXES):
        return (
            f"{name} changes which program runs or how programs load; the deployment sets "
            "it, not a profile"
        )
    return None


class JobEnvError(ValueError):
    """A variable cannot be given to the job; the message says which and why."""


def base() -> dict[str, str]:
    return {name: os.environ[name] for name in settings.LAUNCH_BASE_ENV if name in os.environ}


def build(values: dict, *, profile_env: dict, checkpoint_id: int, token: str) -> dict[str, str]:
    """The job's whole environment (see the module's docstring). `values` are the
    template's placeholder values."""
    env = base()
    for name, value in (profile_env or {}).items():
        if why := refusal(str(name)):
            raise JobEnvError(f"the launch profile's env cannot be used: {why}")
        env[str(name)] = str(value)
    env.update(variables(values))
    env.update(
        {
            "LIFEBOAT_RUN": str(values["new_run_key"]),
            "LIFEBOAT_RESUMED_FROM": str(checkpoint_id),
            "LIFEBOAT_CHECKPOINT": str(values["checkpoint_path"]),
            "LIFEBOAT_URL": settings.LAUNCH_LIFEBOAT_URL,
            "LIFEBOAT_TOKEN": token,
        }
    )
    for name, value in env.items():
        if "\0" in value:
            raise JobEnvError(f"{name} holds a NUL byte, which no environment can carry")
    return env
