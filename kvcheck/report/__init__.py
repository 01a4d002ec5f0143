"""Reports: a trace or a result as text, an HTML page, JUnit XML, a pytest reproducer."""
