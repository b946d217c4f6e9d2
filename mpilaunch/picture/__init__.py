"""A picture of a finished run, drawn from its --report-json document (`mpilaunch report`):
reading.py turns the document into rows, page.py writes the HTML page, chart.py the PNG."""
