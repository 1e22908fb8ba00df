"""The backend-agnostic engine: controller, queues accounting, measurements, policies."""
