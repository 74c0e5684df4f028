"""Signal receivers of the domain app (connected in DomainConfig.ready)."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from webapp.domain.models import ApiToken, Project
from webapp.domain.models.projects import forget_cached_tokens


@receiver(post_save, sender=ApiToken)
@receiver(post_delete, sender=ApiToken)
@receiver(post_save, sender=Project)
@receiver(post_delete, sender=Project)
def _forget_cached_tokens(**kwargs) -> None:
    # A change of scopes, a revocation through the admin, or a change of the project a
    # cached token carries takes effect on this process's next request.
    forget_cached_tokens()
