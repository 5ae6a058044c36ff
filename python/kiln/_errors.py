"""kiln's exceptions (python.md). The extension raises these classes."""


class KilnError(Exception):
    """Any error kiln reports."""


class GraphError(KilnError, ValueError):
    """An invalid graph: the message is the one `kiln validate` prints."""


class BindingError(KilnError, ValueError):
    """Arrays that disagree with the graph (name, shape, dtype, device, strides); nothing was launched."""


class CompileError(KilnError, RuntimeError):
    """A failed compile; the message names the repro folder."""


class DeviceError(KilnError, RuntimeError):
    """A CUDA failure while running."""


class OutOfMemoryError(DeviceError, MemoryError):
    """The device has not the memory a run asked for."""
