"""attn.torch where PyTorch cannot be imported: a clear ImportError, and attn still works."""
import subprocess
import sys

# sys.modules["torch"] = None makes `import torch` fail as if it were not installed.
WITHOUT_TORCH = '''
import sys
sys.modules["torch"] = None
import attn
try:
    import attn.torch
except ImportError as error:
    print("ImportError:", error)
else:
    print("imported")
print("numpy API:", attn.causal_mask(2).shape)
'''


def test_attn_torch_without_pytorch_is_a_clear_import_error():
    """import attn.torch without PyTorch raises ImportError naming torch and the numpy API,
    while import attn keeps working."""
    out = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], capture_output=True,
                         text=True, check=True).stdout
    assert "ImportError: attn.torch needs PyTorch" in out, out
    assert "import attn" in out and "numpy API: (1, 1, 2, 2)" in out, out
