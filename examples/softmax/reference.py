"""The softmax example's reference and baseline (template code: it runs only with
`porter port ... --trust-template-code`; the service refuses a job that carries it).

Called by porter's declared-op harness (docs/TEMPLATES.md, "Declaring your op"):
softmax(x, rows=..., cols=...) gets x as a float32 CuPy array and returns the fp32 result;
torch_softmax(x, y, rows=..., cols=...) gets the kernel's buffers and returns the function to
time."""
import torch


def softmax(x, **sizes):
    return torch.softmax(torch.as_tensor(x, device="cuda").to(torch.float32), dim=-1)


def torch_softmax(x, y, **sizes):
    tx = torch.from_dlpack(x)
    return lambda: torch.softmax(tx, dim=-1)
