"""Scheduled campaign executions: the queue, the actions, the job that runs one, and the sensors."""
