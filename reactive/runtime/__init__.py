"""The task/channel runtime: events, channels, partitioners, operators, tasks and jobs."""
