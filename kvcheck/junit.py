"""JUnit XML for ``kvcheck prove``: one test case per property, so CI shows each."""

from __future__ import annotations

from xml.etree import ElementTree as ET


def junit_xml(report) -> str:
    suites = ET.Element("testsuites", name="kvcheck prove")
    by_engine: dict[str, list] = {}
    for row in report.rows:
        by_engine.setdefault(row.engine, []).append(row)
    for engine, rows in by_engine.items():
        suite = ET.SubElement(suites, "testsuite", name=engine, tests=str(len(rows)),
                              failures=str(sum(1 for r in rows if not r.ok)),
                              time=f"{sum(r.seconds for r in rows):.3f}")
        for r in rows:
            case = ET.SubElement(suite, "testcase", classname=f"kvcheck.{engine.replace(' ', '_')}",
                                 name=f"{r.property} [{r.scope}]", time=f"{r.seconds:.3f}")
            if not r.ok:
                fail = ET.SubElement(case, "failure", message=f"{r.result}: {r.detail}"[:500],
                                     type=r.result)
                fail.text = r.detail
            elif r.detail:
                ET.SubElement(case, "system-out").text = r.detail
    return ET.tostring(suites, encoding="unicode")
