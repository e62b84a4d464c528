"""The Kafka gateway: unmodified Kafka clients produce and consume through
``python -m bookkeeper_aio.kafka``, each topic partition a named log (docs/kafka.md)."""
