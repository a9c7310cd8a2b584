"""llvmlite as the llvm backend's toolchain, as codegen/toolchain.py is the system C compiler for
`c` and `bang`: LLVM IR text compiled to an object file for the host CPU (O3, the loop and SLP
vectorisers), object files loaded into in-process MCJIT engines, and the system libraries whose
symbols the loaded code calls (the OpenMP runtime, the compiler runtime)."""
import ctypes
import ctypes.util
import os

import cffi

from metagraph.codegen.compiled import CompileError, launcher


class Toolchain:
    """llvmlite's compiler and JIT for this host; `openmp` says whether libgomp is loaded."""

    def __init__(self):
        try:
            import llvmlite.binding as llvm
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
        except (ImportError, OSError, RuntimeError) as error:
            raise CompileError(f"llvmlite is unusable: {error}") from None
        self.llvm, self.ffi, self.engines = llvm, cffi.FFI(), {}    # engines: object file -> its MCJIT
        self.openmp = self.load_library("gomp")
        # float16 conversions LLVM leaves to the compiler runtime (float64 -> half, which its
        # optimiser also forms from float32 math rounded to half): unresolved, they were calls to 0
        self.load_library("gcc_s")
        self.machine = self.target_machine()
        self.identity = "\n".join(["llvm", str(llvm.llvm_version_info), self.machine.triple,
                                   llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), "O3"])

    def target_machine(self):
        """A target machine for the host CPU and its features, at O3."""
        llvm = self.llvm
        return llvm.Target.from_default_triple().create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3,
            reloc="pic", codemodel="default")

    def load_library(self, name):
        """Make a system library's symbols visible to the JIT; whether it could be loaded.

        LLVM closes its "permanent" libraries when the process exits, which would unmap the
        OpenMP runtime while its idle worker threads still spin in it (SIGSEGV after the work is
        done); a second handle opened with RTLD_NODELETE keeps it mapped to the end."""
        path = ctypes.util.find_library(name)
        if path is None:
            return False
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NODELETE)
            self.llvm.load_library_permanently(path)
        except (OSError, RuntimeError):
            return False
        return True

    def compile(self, source_path, binary_path):
        """The LLVM IR module in `source_path`, verified, optimised and written as an object file."""
        llvm = self.llvm
        with open(source_path) as stream:
            source = stream.read()
        try:
            module = llvm.parse_assembly(source)
            module.verify()
        except RuntimeError as error:
            raise CompileError(f"LLVM rejected {source_path}: {error}") from None
        module.triple, module.data_layout = self.machine.triple, str(self.machine.target_data)
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization, options.slp_vectorization = True, True
        builder = llvm.create_pass_builder(self.machine, options)
        builder.getModulePassManager().run(module, builder)
        with open(binary_path, "wb") as stream:
            stream.write(self.machine.emit_object(module))

    def open(self, path, name):
        """The kernel `name` of object file `path`. Each object file gets an engine of its own (an
        engine takes its target machine): one engine holding every object of a long test run
        aborted in finalize_object after some thousands of them."""
        if path not in self.engines:
            engine = self.llvm.create_mcjit_compiler(self.llvm.parse_assembly(""), self.target_machine())
            with open(path, "rb") as stream:
                engine.add_object_file(self.llvm.ObjectFileRef.from_data(stream.read()))
            engine.finalize_object()
            self.engines[path] = engine
        address = self.engines[path].get_function_address(name)
        if not address:
            raise AttributeError(f"kernel {name} is missing from {path}")
        return launcher(self.ffi, self.ffi.cast("void (*)(char **, int64_t *)", address))
