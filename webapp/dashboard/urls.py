from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.projects, name="projects"),
    path("p/<slug:slug>/", views.runs, name="runs"),
    path("p/<slug:slug>/runs/<path:key>/", views.run_detail, name="run"),
]
