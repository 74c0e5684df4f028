"""Projects: the unit of access, with members, API tokens, storage and launch settings."""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import PurePosixPath

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from webapp.domain.launch.job_env import refusal
from webapp.domain.launch.template import TemplateRefused, check
from webapp.domain.locks import for_update
from webapp.domain.replication.spelling import normal_endpoint, normal_prefix

TOKEN_PREFIX = "lb_"  # noqa: S105 (a prefix, not a secret)

# Tokens this process has looked up: digest -> (token, monotonic expiry). Only valid
# tokens are kept, so guessing cannot fill it. Cleared by every save of a token or a
# project in this process (webapp/domain/signals.py) and by revoke().
_token_cache: dict[str, tuple[ApiToken, float]] = {}


def forget_cached_tokens() -> None:
    _token_cache.clear()


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    ADMIN = "admin", "Admin"


class Scope(models.TextChoices):
    INGEST = "ingest", "Ingest (send events)"
    READ = "read", "Read runs and checkpoints"
    OPERATE = "operate", "Operate (validate, pin, replicate, resume)"
    # A project admin's powers through the API (webapp/api/settings_*.py): tokens, storage
    # targets, launch profiles, alert channels, members. Only an admin can issue one.
    ADMIN = "admin", "Admin (tokens, storage, launch profiles, alerts, members)"


def validate_allowed_roots(value: object) -> None:
    """Absolute directories, or s3://bucket/prefix for checkpoints that jobs write
    straight to object storage."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValidationError("allowed roots must be a list of absolute paths")
    for root in value:
        if root.startswith("s3://"):
            bucket = root[5:].split("/", 1)[0]
            if not bucket or ".." in root.split("/"):
                raise ValidationError(f"{root!r} is not s3://bucket/prefix without '..'")
            continue
        path = PurePosixPath(root)
        if not path.is_absolute() or ".." in path.parts:
            raise ValidationError(f"{root!r} is not an absolute path without '..'")


def new_badge_key() -> str:
    """A fresh badge key: 128 random bits, URL-safe (the only secret of a badge URL)."""
    return secrets.token_urlsafe(16)


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    # The only directories workers may read checkpoints from (absolute paths).
    allowed_roots = models.JSONField(default=list, blank=True, validators=[validate_allowed_roots])
    # Checkpoints are written to each node's own disk (node-local NVMe), where only that
    # node can read them: the work on each rank's part runs on its host's queues
    # (validate.<host>; webapp/domain/hosts.py). False: one shared file system.
    node_local = models.BooleanField(default=False)
    # Alerts: storage.over_quota when its checkpoints keep more bytes than this.
    storage_quota_bytes = models.BigIntegerField(null=True, blank=True)
    over_quota = models.BooleanField(default=False)
    # Restore tests' deeper levels (webapp/domain/validation/deep_checks.py):
    # {"forward": "pkg.mod:fn",
    # "replay": "pkg.mod:fn", "replay_steps": 5, "replay_rtol": 1e-4}.
    restore_checks = models.JSONField(default=dict, blank=True)
    # Automatic resume of failed or silent runs (webapp/domain/recovery/resume.py), at most
    # max_restarts times along a lineage.
    auto_resume_profile = models.ForeignKey(
        "domain.LaunchProfile", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    max_restarts = models.PositiveIntegerField(default=3)
    # recovery/quarantine.py: a checkpoint is quarantined after this many resumes from it
    # failed before any progress; a lineage's automatic resumes stop after this many
    # attempts in a row made no progress (a restart loop).
    quarantine_after = models.PositiveIntegerField(default=2, db_default=2)
    loop_after = models.PositiveIntegerField(default=3, db_default=3)
    # What one GPU-hour costs this project, for the goodput ledger's money figures
    # (webapp/domain/health/goodput.py); None: no money figures.
    gpu_hour_price = models.FloatField(null=True, blank=True)
    # Status badges (webapp/domain/health/badges.py) are served without a token at URLs that
    # carry this key; an admin regenerates it to retire every URL given out so far.
    badge_key = models.CharField(max_length=32, unique=True, default=new_badge_key)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def role_of(self, user) -> str | None:
        if not user.is_authenticated:
            return None
        if user.is_superuser:
            return Role.ADMIN
        membership = self.memberships.filter(user=user).first()
        return membership.role if membership else None

    def regenerate_badge_key(self) -> str:
        self.badge_key = new_badge_key()
        self.save(update_fields=["badge_key"])
        return self.badge_key

    def issue_token(self, name: str, scopes: list[str], created_by=None) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is not stored and is
        shown to the caller once."""
        unknown = set(scopes) - set(Scope.values)
        if unknown or not scopes:
            raise ValueError(f"scopes must be a non-empty subset of {Scope.values}")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = ApiToken.objects.create(
            project=self,
            name=name,
            prefix=secret[: len(TOKEN_PREFIX) + 6],
            digest=ApiToken.digest_of(secret),
            scopes=sorted(set(scopes)),
            created_by=created_by,
        )
        return token, secret


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"

    def save(self, *args, **kwargs):
        with transaction.atomic():
            if self.pk is not None and self.role != Role.ADMIN:
                was = Membership.objects.filter(pk=self.pk).values_list("role", flat=True)
                if list(was) == [Role.ADMIN]:
                    self._refuse_if_last_admin()
            super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        with transaction.atomic():
            if Membership.objects.filter(pk=self.pk, role=Role.ADMIN).exists():
                self._refuse_if_last_admin()
            return super().delete(*args, **kwargs)

    def clean(self) -> None:
        # The same rule for model forms (the Django admin), as a form error, not a 500.
        if self.pk is not None and self.role != Role.ADMIN:
            was = Membership.objects.filter(pk=self.pk).values_list("role", flat=True)
            others = Membership.objects.filter(project_id=self.project_id, role=Role.ADMIN)
            if list(was) == [Role.ADMIN] and not others.exclude(pk=self.pk).exists():
                raise LastAdmin({"role": f"{self.user} is the last admin of {self.project}."})

    def _refuse_if_last_admin(self) -> None:
        """A project keeps at least one admin: without one nobody could manage its
        members, tokens or storage. The project's row is locked first, so two admins
        demoting each other at once are served one after the other and the second is
        refused. Call inside a transaction."""
        list(for_update(Project.objects.filter(pk=self.project_id)).values("pk"))
        others = Membership.objects.filter(project_id=self.project_id, role=Role.ADMIN)
        if not others.exclude(pk=self.pk).exists():
            raise LastAdmin(
                f"{self.user} is the last admin of {self.project}: make another member an "
                "admin first."
            )


class LastAdmin(ValidationError):
    """Removing or demoting this member would leave the project without an admin."""


class ApiToken(models.Model):
    """A bearer token. Only the SHA-256 of the secret is stored: the secret has 256
    bits of entropy, so a slow password hash would add latency to every request and
    no safety."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise it.")
    digest = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        # Among the tokens in use, a name says which one: a revoked token's name may be
        # given again (rotating "trainer" keeps the name).
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="api_token_name_unique",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def digest_of(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def authenticate(cls, secret: str) -> ApiToken | None:
        """The valid token with this secret, or None.

        A token found is trusted for API_TOKEN_CACHE_SECONDS by this process: it saves
        a query (about 0.9 ms of CPU) on every request of the ingest path. A revocation
        takes effect at once in the process that made it, within that time elsewhere."""
        if not secret.startswith(TOKEN_PREFIX):
            return None
        hit = cls.cached(secret)
        if hit is not None:
            return hit
        digest, now = cls.digest_of(secret), time.monotonic()
        token = cls._look_up(secret)
        if token is None:
            _token_cache.pop(digest, None)
        elif settings.API_TOKEN_CACHE_SECONDS:
            _token_cache[digest] = (token, now + settings.API_TOKEN_CACHE_SECONDS)
        return token

    @classmethod
    def cached(cls, secret: str) -> ApiToken | None:
        """The token this process trusts for the secret without asking the database, or
        None (then authenticate() decides). An event loop can call it; it never waits."""
        hit = _token_cache.get(cls.digest_of(secret))
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    @classmethod
    def _look_up(cls, secret: str) -> ApiToken | None:
        token = (
            cls.objects.select_related("project")
            .filter(digest=cls.digest_of(secret), revoked_at__isnull=True)
            .first()
        )
        if token is not None:
            token.touch()
        return token

    def touch(self) -> None:
        # At most one write a minute per token, so a busy ingest path does not turn
        # every request into an extra UPDATE.
        now = timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

    def revoke(self) -> bool:
        """Revoke the token; False when it already was."""
        now = timezone.now()
        changed = ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(
            revoked_at=now
        )
        forget_cached_tokens()
        if changed:
            self.revoked_at = now
        return bool(changed)

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    @property
    def actor(self) -> str:
        return f"token:{self.name}"


class ReplicationPolicy(models.TextChoices):
    ALL = "all", "Every verified checkpoint"
    BEST = "best", "A new best by a metric"
    EVERY_N = "every_n", "Every Nth step"
    LATEST = "latest", "The latest verified (newer than any copied)"
    MANUAL = "manual", "Only when asked"


class StorageTarget(models.Model):
    """An S3 bucket (and prefix) that replicas of this project's checkpoints go to.
    Credentials are named by reference (an environment variable prefix on the workers),
    never stored or shown here."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="storage_targets")
    name = models.CharField(max_length=100)
    bucket = models.CharField(max_length=255)
    prefix = models.CharField(max_length=500, blank=True)
    endpoint_url = models.URLField(blank=True)
    region = models.CharField(max_length=50, default="us-east-1")
    storage_class = models.CharField(max_length=50, blank=True)
    credentials_ref = models.CharField(
        max_length=100,
        blank=True,
        help_text="Name of the credentials on the workers, e.g. S3_BACKUP reads "
        "S3_BACKUP_ACCESS_KEY_ID and S3_BACKUP_SECRET_ACCESS_KEY.",
    )
    enabled = models.BooleanField(default=True)
    # What a GB (2**30 bytes, as S3 bills) stored for a month costs here, for the storage
    # ledger's money figures (webapp/domain/replication/ledger.py); None: no money figures.
    gb_month_price = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(1000)]
    )
    # Which verified checkpoints are copied here (webapp.domain.replication.policy).
    policy = models.CharField(
        max_length=16, choices=ReplicationPolicy.choices, default=ReplicationPolicy.ALL
    )
    policy_metric = models.CharField(
        max_length=100, blank=True, help_text="For 'best': the metric to compare, e.g. loss."
    )
    policy_mode = models.CharField(
        max_length=3,
        choices=[("min", "lower is better"), ("max", "higher is better")],
        default="min",
    )
    policy_every_n = models.PositiveIntegerField(
        default=1, help_text="For 'every_n': copy checkpoints whose step is a multiple of this."
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="storage_target_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} (s3://{self.bucket}/{self.prefix})"

    def save(self, *args, **kwargs):
        """Saved in one spelling, so that two targets naming one place look alike
        (webapp/domain/replication/namespace.py compares them by place either way)."""
        self.prefix = normal_prefix(self.prefix)
        self.endpoint_url = normal_endpoint(self.endpoint_url)
        self.bucket = (self.bucket or "").strip()
        super().save(*args, **kwargs)


class LaunchKind(models.TextChoices):
    LOCAL = "local", "Local process"
    SLURM = "slurm", "Slurm batch job"


class LaunchProfile(models.Model):
    """How a resumed job is started. Written by project admins only: workers run the
    command template, its placeholders references to environment variables of the job
    (webapp/domain/launch/template.py); clean() refuses a template where a value could
    become code, so every form (dashboard settings, Django admin) refuses it at save."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="launch_profiles")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=LaunchKind.choices, default=LaunchKind.LOCAL)
    host = models.CharField(max_length=255, blank=True, help_text="Launch queue host, if pinned.")
    command_template = models.TextField()
    options = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="launch_profile_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def clean(self) -> None:
        try:
            check(self.command_template or "")
        except TemplateRefused as exc:
            raise ValidationError({"command_template": str(exc)}) from None

        env = (self.options or {}).get("env") or {}
        if not isinstance(env, dict):
            raise ValidationError({"options": "env must be an object of names and values"})
        for name in env:
            if why := refusal(str(name)):
                raise ValidationError({"options": f"env: {why}"})
