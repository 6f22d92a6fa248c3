from __future__ import annotations

from django.urls import path

from notifications import views, views_confirm, views_slack

urlpatterns = [
    path("settings/", views.settings_page, name="notify-settings"),
    path("channels/", views.channel_add_view, name="notify-channel-add"),
    path("channels/<int:pk>/<str:action>/", views.channel_change_view, name="notify-channel-change"),
    path("subscriptions/", views.subscription_save_view, name="notify-subscription-add"),
    path("subscriptions/<int:pk>/", views.subscription_save_view, name="notify-subscription-save"),
    path("subscriptions/<int:pk>/remove/", views.subscription_remove_view, name="notify-subscription-remove"),
    path("link/<str:token>/", views.link_open, name="notify-link"),
    path("confirm/<str:token>/", views_confirm.confirm_view, name="notify-confirm"),
    path("slack/interactions/", views_slack.interactions, name="notify-slack-interactions"),
    path("slack/channels/", views_slack.slack_channel_add, name="notify-slack-channel-add"),
    path("slack/connect/", views_slack.slack_connect_code, name="notify-slack-connect"),
]
