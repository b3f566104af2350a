"""Admission: takes submit, cancel, pause and resume commands and records the verdicts."""
