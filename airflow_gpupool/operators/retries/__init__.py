"""A failed try and the next one: the ladder it is walked up, where a retry resumes, which grant it adopts."""
