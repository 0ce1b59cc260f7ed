"""Prometheus metrics: the queue gauges a Django view serves (``views.metrics``) and the
counters each worker serves itself (``pgq_worker --metrics-port``).

The gauges (:mod:`.queues`) need only the database; the exposition (:mod:`.exposition`,
:mod:`.views`) needs ``prometheus_client``: ``pip install "django-pgqueue-mq[metrics]"``.
"""
