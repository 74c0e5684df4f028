from django.apps import AppConfig


class DomainConfig(AppConfig):
    name = "webapp.domain"
    label = "domain"
    verbose_name = "Lifeboat"
