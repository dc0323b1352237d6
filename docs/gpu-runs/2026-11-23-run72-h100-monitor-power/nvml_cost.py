# CPU time (user+system) of each NVML call gpukit's monitor makes, 200 calls each, device 0
import ctypes, resource, time
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF); return r.ru_utime + r.ru_stime
class FV(ctypes.Structure):
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int), ("value", ctypes.c_ulonglong)]
def fields(ids):
    a = (FV * len(ids))()
    for i, f in enumerate(ids): a[i].fieldId = f
    return lambda: nv.nvmlDeviceGetFieldValues(h, len(ids), a)
u = ctypes.c_uint(); ull = ctypes.c_ulonglong(); buf = ctypes.create_string_buffer(256)
util = (ctypes.c_uint * 2)(); mem = (ctypes.c_ulonglong * 3)()
pci = ctypes.create_string_buffer(512); procs = (ctypes.c_ulonglong * 64)(); n = ctypes.c_uint(8)
pn = ctypes.c_uint(0)
def running():
    n.value = 8; return nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), procs)
def putil():
    pn.value = 0
    return nv.nvmlDeviceGetProcessUtilization(h, None, ctypes.byref(pn), ctypes.c_ulonglong(int(time.time() * 1e6) - 100000))
calls = {
    "GetName": lambda: nv.nvmlDeviceGetName(h, buf, 96),
    "GetUUID": lambda: nv.nvmlDeviceGetUUID(h, buf, 96),
    "GetPciInfo_v3": lambda: nv.nvmlDeviceGetPciInfo_v3(h, pci),
    "GetIndex": lambda: nv.nvmlDeviceGetIndex(h, ctypes.byref(u)),
    "GetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h, util),
    "GetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(h, mem),
    "GetTemperature": lambda: nv.nvmlDeviceGetTemperature(h, 0, ctypes.byref(u)),
    "GetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h, ctypes.byref(u)),
    "GetEnforcedPowerLimit": lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h, ctypes.byref(u)),
    "GetClockInfo(SM)": lambda: nv.nvmlDeviceGetClockInfo(h, 1, ctypes.byref(u)),
    "GetClockInfo(MEM)": lambda: nv.nvmlDeviceGetClockInfo(h, 2, ctypes.byref(u)),
    "GetTotalEnergyConsumption": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(ull)),
    "GetCurrentClocksThrottleReasons": lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h, ctypes.byref(ull)),
    "GetTotalEccErrors": lambda: nv.nvmlDeviceGetTotalEccErrors(h, 1, 0, ctypes.byref(ull)),
    "FieldValues(POWER_INSTANT)": fields([186]),
    "FieldValues(PCIE TX,RX bytes)": fields([197, 198]),
    "FieldValues(all three)": fields([186, 197, 198]),
    "GetComputeRunningProcesses_v3": running,
    "GetProcessUtilization": putil,
    "GetPcieThroughput(TX)": lambda: nv.nvmlDeviceGetPcieThroughput(h, 0, ctypes.byref(u)),
}
for name, f in calls.items():
    rc = f(); N = 20 if "Pcie" in name and "Field" not in name else 200
    c0, t0 = cpu(), time.perf_counter()
    for _ in range(N): f()
    c1, t1 = cpu(), time.perf_counter()
    print(f"{name:34} rc={rc:3} cpu {1e3*(c1-c0)/N:7.3f} ms  wall {1e3*(t1-t0)/N:7.3f} ms a call")
