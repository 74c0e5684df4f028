from django.urls import path

from webapp.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.projects, name="projects"),
    path("p/<slug:slug>/", views.runs, name="runs"),
    path(
        "p/<slug:slug>/checkpoints/<int:checkpoint_id>/", views.checkpoint_detail, name="checkpoint"
    ),
    path("p/<slug:slug>/runs/<path:key>/", views.run_detail, name="run"),
]
