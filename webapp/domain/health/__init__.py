"""Is a run alive: its health rule, alerts and their delivery, badges, analytics, the
families of resumed runs and the problems summary the dashboard shows."""
