"""JUnit XML: suites of test cases, so that CI shows each property or run on its own.

Generic over what produced the cases: ``kvcheck prove`` gives one case per row
(grouped in a suite for what was proved about the spec and one for what was
checked on the target), ``verify`` and friends one case per run or violation.
A case is passed, failed (with its message and text) or skipped (never shown as
passed when it was not checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.etree import ElementTree as ET


@dataclass
class Case:
    classname: str
    name: str
    seconds: float = 0.0
    failure: str | None = None  # the failure's message, if it failed
    failure_type: str = "violation"
    text: str = ""  # the failure's text, or what a passed/skipped case has to say
    skipped: str | None = None  # why it was not checked, if it was not


@dataclass
class Suite:
    name: str
    cases: list[Case] = field(default_factory=list)


def junit_xml(suites: list[Suite], name: str = "kvcheck") -> str:
    """The suites as one ``<testsuites>`` document."""
    all_cases = [c for s in suites for c in s.cases]
    root = ET.Element("testsuites", name=name, tests=str(len(all_cases)),
                      failures=str(sum(1 for c in all_cases if c.failure is not None)))
    for s in suites:
        if not s.cases:
            continue
        suite = ET.SubElement(root, "testsuite", name=s.name, tests=str(len(s.cases)),
                              failures=str(sum(1 for c in s.cases if c.failure is not None)),
                              skipped=str(sum(1 for c in s.cases if c.skipped is not None)),
                              time=f"{sum(c.seconds for c in s.cases):.3f}")
        for c in s.cases:
            case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name,
                                 time=f"{c.seconds:.3f}")
            if c.failure is not None:
                fail = ET.SubElement(case, "failure", message=c.failure[:500], type=c.failure_type)
                fail.text = c.text
            elif c.skipped is not None:
                ET.SubElement(case, "skipped", message=c.skipped[:500])
            elif c.text:
                ET.SubElement(case, "system-out").text = c.text
    return ET.tostring(root, encoding="unicode")
