"""Views: what a person reads of an estimate, a plan or a run, as text (the CLI) or plotly figures (panels,
notebooks, --html). Data in, text or a figure out; imports specs, estimate and plan, never torch.

Imports: specs, estimate."""
