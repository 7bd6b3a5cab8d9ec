"""Other frameworks' integrations, each behind its extra.

Integrations with other frameworks, each behind its extra: ``echomq.contrib.django`` (the
``django`` extra) is a backend for Django's task framework. Nothing here is imported by
``import echomq``."""
