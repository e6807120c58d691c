/* The OpenMP API the sources call, for the WebAssembly build, which has no OpenMP runtime:
 * openmp_runtime.cc implements it (one thread in the single-threaded module; a pthread team in the
 * threaded one, together with the __kmpc_* entry points clang's -fopenmp emits). */
#ifndef ONNXTRAIN_WEB_OMP_H
#define ONNXTRAIN_WEB_OMP_H
#ifdef __cplusplus
extern "C" {
#endif
int omp_get_max_threads(void);
void omp_set_num_threads(int n);
int omp_get_num_threads(void);
int omp_get_thread_num(void);
int omp_in_parallel(void);
int omp_get_num_procs(void);
#ifdef __cplusplus
}
#endif
#endif
