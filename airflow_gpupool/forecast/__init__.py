"""When each waiting request will start: remaining durations, a seeded replay, the controller's step."""
