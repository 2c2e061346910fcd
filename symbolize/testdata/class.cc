// C++ names for the demangling tests.
namespace ns {
struct Class {
	int method(int x);
	int method(double x);
	static int only(int x);
};

__attribute__((noinline)) int Class::method(int x) { return x + 1; } // LINE_METHOD_INT
__attribute__((noinline)) int Class::method(double x) { return (int)x + 2; }
__attribute__((noinline)) int Class::only(int x) { return x * 3; }

static int lock_like_table[4];
int *table_addr() { return &lock_like_table[2]; }
} // namespace ns

int main() {
	ns::Class c;
	return c.method(1) + c.method(2.0) + ns::Class::only(3) + *ns::table_addr();
}
