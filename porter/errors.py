"""One root exception. A PorterError is something the user can fix: the CLI prints its message on
one line and exits with status 2."""


class PorterError(Exception):
    """A problem with user input (template, spec, size, configuration), stated so it can be fixed."""


class TemplateError(PorterError):
    """A template folder or its space file is malformed."""


class ArchError(PorterError):
    """Unknown architecture, or a template that needs a feature the architecture lacks."""


class SpecError(PorterError):
    """A malformed job spec: sizes, budget, sampler, backend."""


class StoreError(PorterError):
    """The database could not be opened or written; the original error is attached as __cause__."""
