"""The course's Python test scripts' one way to assert: check(condition, what) records and prints a failure
and goes on, so that one run names every failure; `failures` decides the exit code."""

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL  {what}")
