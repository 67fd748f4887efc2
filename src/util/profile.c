/*
 * profile.c: the phase profile of the tiled loops (profile.h): per-phase thread CPU
 * time, summed over the threads with relaxed atomic adds, read once by the caller
 * for the verbose trace. Off, nothing is timed.
 */
#include "profile.h"

#include <stdatomic.h>
#include <time.h>

void fa_phases_init(fa_phases *ph, int on)
{
    ph->on = on;
    for (int i = 0; i < FA_PHASES_MAX; i++) atomic_init(&ph->ns[i], 0), atomic_init(&ph->flop[i], 0);
}

double fa_phase_start(const fa_phases *ph)
{
    if (!ph->on) return 0.0;
#if defined(CLOCK_THREAD_CPUTIME_ID)
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
    return fa_now_s();
}

double fa_phase_mark(fa_phases *ph, int phase, double t0)
{
    if (!ph->on) return 0.0;
    const double t = fa_phase_start(ph);
    atomic_fetch_add_explicit(&ph->ns[phase], (long long)((t - t0) * 1e9), memory_order_relaxed);
    return t;
}

void fa_phases_read(const fa_phases *ph, int64_t *us, int64_t *flop)
{
    for (int i = 0; i < FA_PHASES_MAX; i++) {
        us[i] = atomic_load(&ph->ns[i]) / 1000;
        flop[i] = atomic_load(&ph->flop[i]);
    }
}
