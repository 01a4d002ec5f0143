"""JUnit XML for ``kvcheck prove``: one test case per row, so CI shows each."""

from __future__ import annotations

from xml.etree import ElementTree as ET


def junit_xml(report) -> str:
    """Two suites, what was proved about the spec and what was checked on the target; each
    case's class name says which (``kvcheck.spec.<engine>`` / ``kvcheck.target.<engine>``).
    A row that is not applicable at the scope is a skipped case, never a passed one."""
    from kvcheck.prove import NOT_APPLICABLE, SPEC, TARGET

    suites = ET.Element("testsuites", name="kvcheck prove", tests=str(len(report.rows)),
                        failures=str(sum(1 for r in report.rows if not r.ok)))
    names = {SPEC: "spec: proved about the specification",
             TARGET: f"target: checked on {report.target}"}
    for group in (SPEC, TARGET):
        rows = report.group(group)
        if not rows:
            continue
        suite = ET.SubElement(suites, "testsuite", name=names[group], tests=str(len(rows)),
                              failures=str(sum(1 for r in rows if not r.ok)),
                              skipped=str(sum(1 for r in rows if r.result == NOT_APPLICABLE)),
                              time=f"{sum(r.seconds for r in rows):.3f}")
        for r in rows:
            case = ET.SubElement(suite, "testcase",
                                 classname=f"kvcheck.{group}.{r.engine.replace(' ', '_')}",
                                 name=f"{r.property} [{r.scope}]", time=f"{r.seconds:.3f}")
            if not r.ok:
                fail = ET.SubElement(case, "failure", message=f"{r.result}: {r.detail}"[:500],
                                     type=r.result)
                fail.text = r.detail
            elif r.result == NOT_APPLICABLE:  # not checked: never shown as passed
                ET.SubElement(case, "skipped", message=f"{r.result}: {r.detail}"[:500])
            elif r.detail:
                ET.SubElement(case, "system-out").text = r.detail
    return ET.tostring(suites, encoding="unicode")
