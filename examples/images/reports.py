"""An app with its own image: ``humanize`` is not among Ember's dependencies, and the machine that pushes this app
does not need it either. ``ember push`` has the platform lock the image with uv, build its environment on a node
(showing uv's log), and read the app's manifest there, inside the image.

    ember push examples/images/reports.py
    ember call reports.size --data 123456789            # "123.5 MB"
    ember call reports.Report.summary --data '{"n_bytes": 5000000, "seconds": 3700}'

Needs a node that can reach PyPI (the image installs ``humanize`` from there).
"""

import humanize  # only the image has it
import msgspec

import ember

image = ember.Image().pip_install("humanize==4.9.0").env({"REPORT_STYLE": "short"})
app = ember.App("reports", image=image)


@app.function(min_replicas=1)
def size(n_bytes: int) -> str:
    """A size in bytes, for people."""
    return humanize.naturalsize(n_bytes)


class Usage(msgspec.Struct):
    n_bytes: int
    seconds: float


@app.model(min_replicas=1)
class Report:
    @ember.setup(snap=True)  # runs in a zygote built inside the image: replicas fork from it
    def load(self) -> None:
        import os

        self.style = os.environ.get("REPORT_STYLE", "long")
        self.version = humanize.__version__

    @ember.method
    def summary(self, usage: Usage) -> dict:
        return {"stored": humanize.naturalsize(usage.n_bytes), "took": humanize.naturaldelta(usage.seconds),
                "style": self.style, "humanize": self.version}
