from django.urls import path

from django_project import views

urlpatterns = [
    path("add/", views.enqueue_add),
    path("explode/", views.enqueue_explode),
    path("result/<str:result_id>/", views.result),
]
