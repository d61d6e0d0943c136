# OpenMP entry points that also compile without OpenMP (the scikit-learn
# pattern): a serial build gets one-thread stand-ins and CN_OPENMP == 0.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    #define CN_OPENMP 1
    #else
    #define CN_OPENMP 0
    static int omp_get_max_threads(void) { return 1; }
    static int omp_get_num_threads(void) { return 1; }
    static int omp_get_num_procs(void) { return 1; }
    static int omp_in_parallel(void) { return 0; }
    #endif
    """
    bint CN_OPENMP
    int omp_get_max_threads() noexcept nogil
    int omp_get_num_threads() noexcept nogil
    int omp_get_num_procs() noexcept nogil
    bint omp_in_parallel() noexcept nogil
