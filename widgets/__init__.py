"""ipywidgets panels over toolkit (planner, launcher): views of a Job, no maths here.

Imports: specs, estimate, runs, plan, views, train."""
