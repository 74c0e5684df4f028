from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "webapp.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        from webapp.dashboard import natural_sort  # noqa: F401 (SQLite's natural_sort collation)
