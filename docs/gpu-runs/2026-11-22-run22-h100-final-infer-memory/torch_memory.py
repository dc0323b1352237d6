# PyTorch's side of gpukit memory: ResNet-50 inference peak memory (torch.no_grad, cudnn.benchmark off)
import json, os, subprocess, sys, torch, torchvision
def nvml_proc_used():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, used = [x.strip() for x in line.split(",")]
        if int(pid) == os.getpid(): return int(used) * 2**20
torch.backends.cudnn.benchmark = False
x = torch.zeros(1, device="cuda"); torch.cuda.synchronize()
res = {"torch": torch.__version__, "after_init_allocated": torch.cuda.memory_allocated(), "after_init_process_used_nvml": nvml_proc_used()}
for dtype, cl in [(torch.float32, False), (torch.float16, True)]:
    m = torchvision.models.resnet50().eval().to("cuda", dtype)
    if cl: m = m.to(memory_format=torch.channels_last)
    for n in [16, 32, 64, 128]:
        inp = torch.randn(n, 3, 224, 224, device="cuda", dtype=dtype)
        if cl: inp = inp.to(memory_format=torch.channels_last)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        with torch.no_grad(): m(inp)
        torch.cuda.synchronize()
        res[f"{dtype}-{'cl' if cl else 'nchw'}-b{n}"] = {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved(), "weights_and_input": torch.cuda.memory_allocated()}
        del inp
    del m; torch.cuda.empty_cache()
print(json.dumps(res, indent=1))
