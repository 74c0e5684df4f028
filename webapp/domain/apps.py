from django.apps import AppConfig


class DomainConfig(AppConfig):
    name = "webapp.domain"
    label = "domain"
    verbose_name = "Lifeboat"

    def ready(self) -> None:
        from webapp.domain import signals  # noqa: F401 (connects the receivers)
