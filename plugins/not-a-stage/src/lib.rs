//! Test plugin: a valid component that does not implement the `stage` world.
#[unsafe(no_mangle)]
pub extern "C" fn add(a: i32, b: i32) -> i32 {
    a + b
}
