/* A fake libnvidia-ml.so.1 that the REAL pynvml loads, so tests run gpupool's NVML code path with no GPU.
 * TEST ONLY. Build: gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c   (tests/agent/conftest.py does this)
 *
 * Configured from the environment, read once on first use:
 *   FAKE_NVML_GPUS="NVIDIA H100 80GB HBM3:81559,Tesla T4:15360"  name:MiB per GPU (at most 16)
 *   FAKE_NVML_DRIVER_NOT_LOADED=1      nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_NOT_SUPPORTED=1          GPU index whose optional queries (utilization, temperature, power, ECC,
 *                                      NUMA, NVLink, MIG mode, events) return NVML_ERROR_NOT_SUPPORTED
 *   FAKE_NVML_UTIL="37,0"              per-GPU utilization %; memory used = total * util / 100 (default 0)
 *   FAKE_NVML_ECC="0,2"                per-GPU uncorrected volatile ECC count (default 0)
 *   FAKE_NVML_MIG="0=1g.10gb+3g.40gb"  GPU index = MIG profiles; MIG mode on, one MIG device per profile
 *   FAKE_NVML_NVLINK="0-1,2-3"         GPU pairs joined by an active NVLink (one link per pair and end)
 *   FAKE_NVML_NVSWITCH="4,5"           GPUs with one active link to an NVSwitch
 *   FAKE_NVML_XID="1:79,0:13"          Xid events delivered once, in order, by nvmlEventSetWait_v2
 *   FAKE_NVML_LOST=2                   GPU index whose memory query fails with NVML_ERROR_GPU_IS_LOST
 * Functions not defined here make pynvml raise NVMLError_FunctionNotFound, as an old driver would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6, DRIVER_NOT_LOADED = 9, TIMEOUT = 10 };
enum { GPU_IS_LOST = 15 };
enum { MAXG = 16, MAXMIG = 7, MAXLINK = 18, MAXXID = 64, MIG_BASE = 1000 };

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef void *nvmlDevice_t;
typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType, eventData;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

static int ngpu = -1, unsupported = -1, lost = -1;
static char names[MAXG][96];
static unsigned long long mem_mib[MAXG], util[MAXG], ecc[MAXG];
static int nmig[MAXG];
static char mig_profile[MAXG][MAXMIG][32];
static int nlinks[MAXG], link_to[MAXG][MAXLINK]; /* peer GPU index, or -2 for an NVSwitch */
static int xid_gpu[MAXXID], xid_code[MAXXID], nxid, next_xid;

static void parse_list(const char *env, unsigned long long *out) {
  const char *e = getenv(env);
  for (int i = 0; e && *e && i < MAXG; i++) {
    out[i] = strtoull(e, (char **)&e, 10);
    if (*e == ',') e++;
  }
}

static void add_link(int a, int b) {
  if (a >= 0 && a < ngpu && nlinks[a] < MAXLINK) link_to[a][nlinks[a]++] = b;
}

static void parse_topology(void) {
  char buf[1024], *save, *tok;
  const char *e = getenv("FAKE_NVML_NVLINK");
  snprintf(buf, sizeof buf, "%s", e ? e : "");
  for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int a, b;
    if (sscanf(tok, "%d-%d", &a, &b) == 2 && b >= 0 && b < ngpu) { add_link(a, b); add_link(b, a); }
  }
  e = getenv("FAKE_NVML_NVSWITCH");
  snprintf(buf, sizeof buf, "%s", e ? e : "");
  for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) add_link(atoi(tok), -2);
}

static void parse_mig(void) {
  char buf[1024], *save, *tok, *save2, *prof;
  const char *e = getenv("FAKE_NVML_MIG");
  snprintf(buf, sizeof buf, "%s", e ? e : "");
  for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    int g = atoi(tok);
    if (!eq || g < 0 || g >= ngpu) continue;
    for (prof = strtok_r(eq + 1, "+", &save2); prof && nmig[g] < MAXMIG; prof = strtok_r(NULL, "+", &save2))
      snprintf(mig_profile[g][nmig[g]++], 32, "%s", prof);
    if (nmig[g] == 0) nmig[g] = -1; /* MIG on, no instances yet: marked by a negative count */
  }
}

static void parse_xids(void) {
  char buf[1024], *save, *tok;
  const char *e = getenv("FAKE_NVML_XID");
  snprintf(buf, sizeof buf, "%s", e ? e : "");
  for (tok = strtok_r(buf, ",", &save); tok && nxid < MAXXID; tok = strtok_r(NULL, ",", &save))
    if (sscanf(tok, "%d:%d", &xid_gpu[nxid], &xid_code[nxid]) == 2) nxid++;
}

static void load(void) {
  if (ngpu >= 0) return;
  ngpu = 0;
  const char *e = getenv("FAKE_NVML_GPUS");
  char buf[4096], *save, *tok;
  snprintf(buf, sizeof buf, "%s", e ? e : "");
  for (tok = strtok_r(buf, ",", &save); tok && ngpu < MAXG; tok = strtok_r(NULL, ",", &save)) {
    char *c = strrchr(tok, ':');
    if (c) { *c = 0; mem_mib[ngpu] = strtoull(c + 1, 0, 10); }
    snprintf(names[ngpu], sizeof names[ngpu], "%s", tok);
    ngpu++;
  }
  if ((e = getenv("FAKE_NVML_NOT_SUPPORTED"))) unsupported = atoi(e);
  if ((e = getenv("FAKE_NVML_LOST"))) lost = atoi(e);
  parse_list("FAKE_NVML_UTIL", util);
  parse_list("FAKE_NVML_ECC", ecc);
  parse_topology();
  parse_mig();
  parse_xids();
}

/* Handles: GPU i is (i + 1); MIG device k of GPU i is MIG_BASE + i * MAXMIG + k + 1. */
static int idx(nvmlDevice_t d) { long i = (long)d - 1; return (i >= 0 && i < ngpu) ? (int)i : -1; }
static int mig_parent(nvmlDevice_t d) {
  long m = (long)d - MIG_BASE - 1;
  return (m >= 0 && m / MAXMIG < ngpu && m % MAXMIG < nmig[m / MAXMIG]) ? (int)(m / MAXMIG) : -1;
}
static int mig_slot(nvmlDevice_t d) { return (int)(((long)d - MIG_BASE - 1) % MAXMIG); }
static int optional_ok(int i) { return i < 0 ? INVALID_ARGUMENT : i == unsupported ? NOT_SUPPORTED : OK; }
static unsigned long long profile_mib(const char *p) { /* "3g.40gb" -> 40 GiB */
  const char *g = strchr(p, '.');
  return g ? strtoull(g + 1, 0, 10) * 1024 : 1024;
}
static void bus_id(int i, char *out, size_t n) {
  snprintf(out, n, "00000000:%02X:00.0", (unsigned int)(0x10 + i) & 0xFFu);
}

int nvmlInitWithFlags(unsigned int f) {
  (void)f;
  load();
  return getenv("FAKE_NVML_DRIVER_NOT_LOADED") ? DRIVER_NOT_LOADED : OK;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int r) { return r == NOT_SUPPORTED ? "Not Supported" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "550.00.fake"); return OK; }
int nvmlDeviceGetCount_v2(unsigned int *c) { load(); *c = (unsigned int)ngpu; return OK; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  load();
  if ((int)i >= ngpu) return INVALID_ARGUMENT;
  *d = (nvmlDevice_t)(long)(i + 1);
  return OK;
}

int nvmlDeviceGetName(nvmlDevice_t d, char *n, unsigned int len) {
  int i = idx(d), p = mig_parent(d);
  if (i >= 0) { snprintf(n, len, "%s", names[i]); return OK; }
  if (p >= 0) { snprintf(n, len, "%s MIG %s", names[p], mig_profile[p][mig_slot(d)]); return OK; }
  return INVALID_ARGUMENT;
}
int nvmlDeviceGetUUID(nvmlDevice_t d, char *u, unsigned int len) {
  int i = idx(d), p = mig_parent(d);
  if (i >= 0) { snprintf(u, len, "GPU-00000000-0000-0000-0000-%012d", i); return OK; }
  if (p >= 0) { snprintf(u, len, "MIG-00000000-0000-0000-%04d-%012d", p, mig_slot(d)); return OK; }
  return INVALID_ARGUMENT;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  int i = idx(d), p = mig_parent(d);
  if (i >= 0 && i == lost) return GPU_IS_LOST;
  if (i >= 0) { m->total = mem_mib[i] << 20; m->used = m->total / 100 * util[i]; }
  else if (p >= 0) { m->total = profile_mib(mig_profile[p][mig_slot(d)]) << 20; m->used = 0; }
  else return INVALID_ARGUMENT;
  m->free = m->total - m->used;
  return OK;
}
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
  int i = idx(d);
  if (i < 0) return INVALID_ARGUMENT;
  memset(pci, 0, sizeof *pci);
  pci->bus = 0x10 + i;
  bus_id(i, pci->busId, sizeof pci->busId);
  snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", (unsigned int)(0x10 + i) & 0xFFu);
  return OK;
}
int nvmlDeviceGetNumaNodeId(nvmlDevice_t d, int *node) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *node = i * 2 / (ngpu ? ngpu : 1);
  return r;
}

int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) { u->gpu = (unsigned int)util[i]; u->memory = (unsigned int)util[i] / 2; }
  return r;
}
int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *t = sensor == 0 ? 40 + (unsigned int)i : 0;
  return r;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *mw = 70000 + 3000 * (unsigned int)util[i] + 400; /* rounds to whole watts */
  return r;
}
int nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int error_type, int counter_type, unsigned long long *count) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *count = (error_type == 1 && counter_type == 0) ? ecc[i] : 0;
  return r;
}

int nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pend) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *cur = *pend = nmig[i] != 0;
  return r;
}
int nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
  int i = idx(d), r = optional_ok(i);
  if (r == OK) *count = nmig[i] != 0 ? MAXMIG : 0;
  return r;
}
int nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int k, nvmlDevice_t *mig) {
  int i = idx(d), r = optional_ok(i);
  if (r != OK) return r;
  if (k >= MAXMIG) return INVALID_ARGUMENT;
  if ((int)k >= nmig[i]) return NOT_FOUND;
  *mig = (nvmlDevice_t)(long)(MIG_BASE + i * MAXMIG + (int)k + 1);
  return OK;
}
int nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
  if (mig_parent(d) < 0) return INVALID_ARGUMENT;
  *id = 1 + 2 * (unsigned int)mig_slot(d);
  return OK;
}

int nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, unsigned int *active) {
  int i = idx(d), r = optional_ok(i);
  if (r != OK) return r;
  if (link >= MAXLINK) return INVALID_ARGUMENT;
  *active = (int)link < nlinks[i];
  return OK;
}
int nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci) {
  int i = idx(d), r = optional_ok(i);
  if (r != OK) return r;
  if ((int)link >= nlinks[i]) return INVALID_ARGUMENT;
  memset(pci, 0, sizeof *pci);
  if (link_to[i][link] >= 0) bus_id(link_to[i][link], pci->busId, sizeof pci->busId);
  else snprintf(pci->busId, sizeof pci->busId, "00000000:C0:00.0"); /* the NVSwitch, not a GPU */
  return OK;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t d, unsigned int link, int *type) {
  int i = idx(d), r = optional_ok(i);
  if (r != OK) return r;
  if ((int)link >= nlinks[i]) return INVALID_ARGUMENT;
  *type = link_to[i][link] >= 0 ? 0 : 2; /* NVML_NVLINK_DEVICE_TYPE_GPU / _SWITCH */
  return OK;
}

typedef struct { int unused; } *nvmlEventSet_t;
int nvmlEventSetCreate(nvmlEventSet_t *set) { *set = (nvmlEventSet_t)(long)1; return OK; }
int nvmlEventSetFree(nvmlEventSet_t set) { (void)set; return OK; }
int nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
  (void)types; (void)set;
  return optional_ok(idx(d));
}
int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
  (void)set; (void)timeout_ms;
  while (next_xid < nxid && xid_gpu[next_xid] == unsupported) next_xid++; /* not registered */
  if (next_xid >= nxid) return TIMEOUT;
  memset(data, 0, sizeof *data);
  data->device = (nvmlDevice_t)(long)(xid_gpu[next_xid] + 1);
  data->eventType = 0x8; /* nvmlEventTypeXidCriticalError */
  data->eventData = (unsigned long long)xid_code[next_xid++];
  return OK;
}
