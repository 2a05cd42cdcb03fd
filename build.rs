// Migrations are embedded with refinery's macro; rebuild when they change.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
